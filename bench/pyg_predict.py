"""PyG inference with a grinnder model file, beside `grinnder predict` (on the GPU machine).

    python3 bench/pyg_predict.py NPY_DIR MODEL.safetensors GRINNDER_LOGITS.npy [REPS]

Loads the graph from the npy exchange layout (`grinnder export --format npy`), builds the model
the file's metadata describes from PyG's layers (docs/model-files.md: GCN, SAGE, GIN stacks;
no norm or residual), loads its tensors, times full-batch inference on the GPU (median of REPS
after a warm-up, CUDA events, logits copied to the host as `grinnder predict` does) and
compares its logits with grinnder's.
"""

import json
import sys
import time

import numpy as np
import torch
import torch_geometric
from safetensors import safe_open
from safetensors.torch import load_file
from torch_geometric.nn import GCNConv, GINConv, SAGEConv


def main():
    npy, model_path, theirs = sys.argv[1:4]
    reps = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    with safe_open(model_path, "pt") as f:
        meta = f.metadata()
    kind, layers = meta["model"], int(meta["layers"])
    assert meta.get("norm", "none") == "none" and meta.get("residual", "false") == "false", meta
    dims = [int(meta["in_features"])] + [int(meta["hidden"])] * (layers - 1) + [int(meta["classes"])]
    conv = {"gcn": lambda i, o: GCNConv(i, o, cached=False),
            "sage": SAGEConv,
            "gin": lambda i, o: GINConv(torch.nn.Sequential(torch.nn.Linear(i, o), torch.nn.ReLU(),
                                                            torch.nn.Linear(o, o)))}[kind]
    convs = torch.nn.ModuleList([conv(dims[l], dims[l + 1]) for l in range(layers)])
    state = {k[len("convs."):]: v for k, v in load_file(model_path).items()}
    convs.load_state_dict(state, strict=True)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    convs = convs.to(dev).eval()
    t0 = time.time()
    x = torch.from_numpy(np.load(f"{npy}/node_feat.npy")).to(dev)
    if meta.get("feature_norm") == "row":
        x = x - float(meta["feature_shift"])
        x = x / x.sum(1, keepdim=True).clamp(min=1)
    ei = torch.from_numpy(np.load(f"{npy}/edge_index.npy")).to(dev)
    load_s = time.time() - t0
    # the two ways a PyG user passes the graph: edge_index (messages materialised per edge), and
    # the sparse layout PyG recommends for full-batch work (CSR of the transposed adjacency; the
    # graph is symmetric)
    n = x.shape[0]
    csr = torch_geometric.utils.to_torch_csr_tensor(ei, size=(n, n))
    for layout, graph in (("edge_index", ei), ("csr", csr)):
        def forward():
            h = x
            for l, c in enumerate(convs):
                h = c(h, graph)
                if l + 1 < len(convs):
                    h = h.relu()
            return h.cpu()

        try:
            with torch.no_grad():
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats()
                forward()
                times = []
                for _ in range(reps):
                    if dev.type == "cuda":
                        torch.cuda.synchronize()
                    a = time.perf_counter()
                    out = forward()
                    times.append(time.perf_counter() - a)
        except torch.OutOfMemoryError as e:
            print(json.dumps({"layout": layout, "out_of_memory": str(e).split(".")[0]}))
            continue
        g = np.load(theirs, mmap_mode="r")
        scale = float(np.abs(out.numpy()).max())
        worst = float(np.abs(out.numpy() - g).max())
        print(json.dumps({
            "layout": layout, "pyg": torch.__version__ + " / PyG " + torch_geometric.__version__, "model": kind,
            "layers": layers, "hidden": dims[1], "forward_s_median": sorted(times)[len(times) // 2],
            "forward_s": times,
            "peak_gpu_gib": torch.cuda.max_memory_allocated() / 2**30 if dev.type == "cuda" else None,
            "load_s": load_s, "largest_difference_to_grinnder": worst, "relative": worst / scale,
        }))


if __name__ == "__main__":
    main()
