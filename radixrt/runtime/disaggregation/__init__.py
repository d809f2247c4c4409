"""Prefill-decode disaggregation: the request edge's checks (edge.py), the KV pages' layout in
memory (kv_layout.py), Mooncake's transfer engine (mooncake_engine.py), the thread that talks to the
peer server and moves the bytes (agent.py, prefill_agent.py, decode_agent.py) and the scheduler's
KVLink over it (link.py). Nothing here is imported unless --disaggregation-mode is set."""
