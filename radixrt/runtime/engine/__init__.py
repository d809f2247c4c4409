"""The in-process Engine (SGLang's offline API over the same Scheduler, no HTTP), its per-request
result, and the factory that builds the scheduler over a real model."""
