"""Prefill-decode disaggregation: the request edge's checks (edge.py), the authenticated channel
between the pair (channel.py), the messages over it and inside a server, typed (wire.py), the checks
of what a peer sends beyond its type (peer_checks.py), the KV pages' layout and bytes (kv_layout.py,
page_bytes.py), the thread that talks to the peer server and moves the bytes (agent.py,
prefill_agent.py, decode_agent.py) and the scheduler's KVTransfer over it (transfer.py). Nothing
here is imported unless --disaggregation-mode is set."""
