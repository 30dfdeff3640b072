"""Peak resident memory of handing a graph to `grinnder.Dataset.from_arrays` (issue 27's bar: a
numpy graph already in the right layout is not copied).

    python3 bench/from_arrays_rss.py GRAPH

Writes GRAPH's arrays (edge_index int64 [2, E], x float32 [N, F], y, split indices) to npy files
in a temporary folder, then runs each case in a fresh process: load the arrays, note the resident
memory, reset the peak (/proc/self/clear_refs), call from_arrays, and print its peak and what it
still holds above the resident memory before the call, beside the sizes of x and edge_index.
Cases: x as it is (C-contiguous float32: read in place), and x Fortran-ordered (converted once).
"""

import gc
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import grinnder

NAMES = ("edge_index", "x", "y", "train_idx", "valid_idx", "test_idx")


def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def case(folder, layout):
    a = {k: np.load(Path(folder) / f"{k}.npy") for k in NAMES}
    if layout == "fortran":
        a["x"] = np.asfortranarray(a["x"])
    gc.collect()
    before = status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak (VmHWM) starts again from the resident memory now
    d = grinnder.Dataset.from_arrays(**a)
    peak, held = status("VmHWM") - before, status("VmRSS") - before
    gib = lambda b: f"{b / 2**30:.3f} GiB"
    print(f"from_arrays, x {layout:8}: features_borrowed={d.features_borrowed}, peak +{gib(peak)}, "
          f"held after +{gib(held)} (x {gib(a['x'].nbytes)}, edge_index {gib(a['edge_index'].nbytes)}; "
          f"the CSR {d.num_edges:,} edges)", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "--case":
        case(sys.argv[2], sys.argv[3])
        sys.exit()
    with tempfile.TemporaryDirectory() as folder:
        ds = grinnder.load_dataset(sys.argv[1])
        arrays = {"edge_index": ds.edge_index(), "x": ds.features(), "y": ds.labels()}
        arrays.update({f"{k}_idx": ds.split(k) for k in ("train", "valid", "test")})
        print(f"{ds!r}")
        for k, v in arrays.items():
            np.save(Path(folder) / f"{k}.npy", v)
        del ds, arrays
        for layout in ("in-place", "fortran"):
            subprocess.run([sys.executable, __file__, "--case", folder, layout], check=True)
