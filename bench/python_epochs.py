"""The Python side of bench/gpu_python.sh: trains GRAPH with the given settings through
`import grinnder`, one `train_epoch()` call per epoch, and prints one JSON line per epoch with
the call's wall time (perf_counter around the call: the engine's epoch plus the binding's cost —
the GIL, the metrics dict) beside the engine's own `epoch_s` and `eval_s` (the CLI's metrics lines
carry the same two).

    python3 bench/python_epochs.py GRAPH '{"device": "cuda", "epochs": 10, ...}'
"""

import json
import sys
import time

import grinnder

graph, settings = sys.argv[1], json.loads(sys.argv[2])
t0 = time.perf_counter()
trainer = grinnder.Trainer(grinnder.load_dataset(graph), **settings)
print(json.dumps({"setup_s": time.perf_counter() - t0}), flush=True)
for _ in range(settings["epochs"]):
    t = time.perf_counter()
    m = trainer.train_epoch()
    wall = time.perf_counter() - t
    print(json.dumps({"epoch": m["epoch"], "call_s": wall, "epoch_s": m["epoch_s"], "eval_s": m.get("eval_s", 0.0), "loss": m["loss"],
                      "test_acc": m.get("test_acc"), "peak_device_bytes": m.get("peak_device_bytes")}),
          flush=True)
