"""One process of a two-process run that only steps a PreemptionWatcher (no model): prints the
step at which the watcher told it to stop. Used by tests/test_preemption.py.

    python tests/preemption_worker.py PROCESS_ID PORT [MAINTENANCE_URL]
"""

import os
import sys
import time

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"

import jax  # noqa: E402

from t5x_like import preemption  # noqa: E402


def main() -> None:
    process_id, port = int(sys.argv[1]), sys.argv[2]
    url = sys.argv[3] if len(sys.argv) > 3 else None
    jax.distributed.initialize(
        coordinator_address=f"localhost:{port}", num_processes=2, process_id=process_id
    )
    watcher = preemption.PreemptionWatcher(maintenance_event_url=url, poll_seconds=0.05)
    print("ready", flush=True)
    for step in range(1, 600):
        time.sleep(0.05)
        if watcher.should_stop(step):
            print(f"stopped at step {step} by {watcher.signal_name}", flush=True)
            break
    else:
        print("never stopped", flush=True)
    watcher.close()
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
