# Makes ogbn_npz_tiny/: OGB's binary node-property layout as numpy writes it (np.savez_compressed),
# for crates/graph/tests/suite/ogb_npz.rs. Run from this folder: python make_ogbn_npz_tiny.py
import gzip, os
import numpy as np

root = "ogbn_npz_tiny"
os.makedirs(f"{root}/raw", exist_ok=True)
os.makedirs(f"{root}/split/time", exist_ok=True)
# Fortran-ordered, as numpy stores a transposed array: (source, target) pairs one after the other
edge_index = np.array([[0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [0, 2], [5, 0]], dtype=np.int64).T
node_feat = (np.arange(18, dtype=np.float32).reshape(6, 3) - 4.5) / 4
np.savez_compressed(f"{root}/raw/data.npz", edge_index=edge_index, node_feat=node_feat,
                    num_nodes_list=np.array([6], dtype=np.int64), num_edges_list=np.array([7], dtype=np.int64),
                    node_year=np.array([[2001], [2002], [2003], [2004], [2005], [2006]], dtype=np.int64))
np.savez_compressed(f"{root}/raw/node-label.npz",
                    node_label=np.array([[2], [0], [np.nan], [1], [np.nan], [2]], dtype=np.float64))
for name, ids in [("train", [0, 1]), ("valid", [3]), ("test", [5, 2])]:
    with gzip.open(f"{root}/split/time/{name}.csv.gz", "wt") as f:
        f.write("".join(f"{i}\n" for i in ids))
