"""A tensor parallel worker rank (`python -m radixrt.runtime.model.tp_worker RANK INIT_METHOD
CONFIG_JSON`, started by tp.start_workers): load this rank's shard, then run every forward rank 0
broadcasts, until STOP."""

from __future__ import annotations

import json
import logging
import os
import sys

from radixrt.runtime.model.tp import TPFailure

log = logging.getLogger(__name__)


def run_worker(config_dict: dict, rank: int, init_method: str) -> None:
    """A worker rank: load its shard, then run every forward rank 0 broadcasts, until STOP."""
    from radixrt.runtime.config import ServerConfig
    from radixrt.runtime.model.model_runner import ModelRunner
    from radixrt.runtime.processes import set_parent_death_signal

    set_parent_death_signal()
    config = ServerConfig(**config_dict)
    logging.basicConfig(
        level=config.log_level.upper(), format=f"[tp{rank}] %(levelname)s %(message)s"
    )
    try:
        runner = ModelRunner(config, tp_rank=rank, init_method=init_method)
        runner.serve_worker()
    except TPFailure as e:
        log.error("%s", e)
        os._exit(1)
    os._exit(0)


if __name__ == "__main__":
    run_worker(json.loads(sys.argv[3]), int(sys.argv[1]), sys.argv[2])
