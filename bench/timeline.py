#!/usr/bin/env python3
"""Sums a GRINNDER_CUDA_TIMELINE file per training step (mini-batch).

    GRINNDER_CUDA_TIMELINE=/tmp/t.tsv grinnder train ... --mode minibatch
    python3 bench/timeline.py /tmp/t.tsv [--skip 10]

A step runs from one `rows arrived` mark on the main stream to the next. For each, the
host's time (queueing, or waiting) and the main stream's time between its marks, and the
second stream's gather or upload of the rows it took (the k-th on the second stream feeds the
k-th step: runs with evaluation, or with empty batches, pair them wrongly after that point;
use `--eval-every 0`). Medians and means over the steps after the first `--skip`.
"""
import argparse
import csv
import statistics
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--skip", type=int, default=10)
    a = ap.parse_args()
    main_marks, side = [], []
    with open(a.file) as f:
        for r in csv.DictReader(f, delimiter="\t"):
            m = (r["label"], float(r["device_ms"]), float(r["host_ms"]))
            (main_marks if r["stream"] == "main" else side).append(m)
    starts = [m for m in side if m[0].endswith("start")]
    ends = [m for m in side if m[0].endswith("end")]
    # a step runs from its rows' arrival on the main stream to the next step's
    steps, cur = [], None
    for label, d, h in main_marks:
        if label == "rows arrived":
            if cur is not None:
                steps.append(cur)
            cur = {}
        if cur is not None:
            cur.setdefault(label, (d, h))
    rows = []
    for k in range(len(steps) - 1):
        s, nxt = steps[k], steps[k + 1]
        if "logits" not in s:
            continue
        ar, lo, na = s["rows arrived"], s["logits"], nxt["rows arrived"]
        row = {
            "host: whole step": na[1] - ar[1],
            "host: queueing the forward": lo[1] - ar[1],
            "host: the rest (loss, backward, update, next batch)": na[1] - lo[1],
            "main: whole step": na[0] - ar[0],
            "main: forward": lo[0] - ar[0],
            "main: loss, backward, update (to the next rows)": na[0] - lo[0],
            "main: forward behind the host": lo[0] - lo[1],
        }
        if "loss read" in s:
            # the loss read in this step: the batch before's, read once this step's backward
            # pass is queued (the trainer does not wait for a step's own loss)
            row["host: from the logits to reading the last loss"] = s["loss read"][1] - lo[1]
        if k < len(starts) and k < len(ends):
            row["side: rows' transfer"] = ends[k][1] - starts[k][1]
            row["side: queued before main took the rows"] = ar[1] - starts[k][2]
            row["side: done before main needed them"] = ar[0] - ends[k][1]
        rows.append(row)
    rows = rows[a.skip:]
    if not rows:
        sys.exit(f"{a.file}: no complete steps past the first {a.skip}")
    print(f"{len(rows)} steps (after {a.skip}); ms per step: median, mean")
    for key in rows[0]:
        v = [r[key] for r in rows if key in r]
        print(f"  {key:<52} {statistics.median(v):8.3f} {statistics.mean(v):8.3f}")


if __name__ == "__main__":
    main()
