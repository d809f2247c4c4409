"""What starts, watches and stops processes: `radixrt serve`'s three processes and their watchdog
(launch.py), N replicas behind a gateway (dp_launch.py, router_main.py: smg or sglang-router) and a
local prefill-decode pair (pd_launch.py)."""
