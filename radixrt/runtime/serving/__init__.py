"""`radixrt serve`: the server, one sub-package for each place its code runs.

- `http/`: the main process. The FastAPI app, SGLang's native routes and the admin ones, and what
  stands behind them: the tokenizer manager (tokenizes, runs the request edge, sends), its client of
  the scheduler process (sockets, heartbeats, the deltas routed back) and the per-tenant caps.
- `openai_api/`: also the main process. OpenAI's protocol: /v1/completions, /v1/chat/completions
  with tools and reasoning models, the Responses API, and the tool-call parsers.
- `backend/`: the two child processes. The scheduler's ZeroMQ loop around core's Scheduler (with its
  LoRA loads and the step profiler) and the detokenizer.
- `launch/`: what starts, watches and stops processes: `radixrt serve` itself, data parallelism
  behind a gateway, a local prefill-decode pair, the gateway's launcher.
"""
