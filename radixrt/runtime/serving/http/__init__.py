"""The main process of `radixrt serve`: the FastAPI app (http_app.py) and its gate, SGLang's native
and admin routes (*_routes.py), the bodies they parse (protocol.py), the TokenizerManager that
tokenizes, runs the request edge (request/edge.py) and sends, its SchedulerClient (the sockets to
the scheduler process, heartbeats, the deltas routed back to each RequestHandle), the per-tenant
caps (tenants.py) and the Prometheus metrics. The OpenAI routes (openai_api/) run here too."""
