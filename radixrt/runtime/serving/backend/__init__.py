"""The two child processes of `radixrt serve`: the scheduler process (scheduler_process.py: a ZeroMQ
loop around core's Scheduler and the model runner, with LoRA adapters read off its loop,
lora_loads.py, and torch.profiler around its steps, step_profiler.py) and the detokenizer process
(detokenizer.py: token ids in, text deltas out)."""
