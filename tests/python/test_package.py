"""`import grinnder` against the `grinnder` command on Cora (CPU): the same losses, accuracy and
predictions from files, arrays and PyG `Data`; the loaders' errors as Python exceptions;
settings checked by name; Ctrl-C between epochs leaves a trainer that goes on as if never
stopped.

Needs the package built into the Python running the tests (`pip install .`, or `maturin
develop`); skipped, saying so, where it is not (CI installs it).
"""

import json
import os
import signal
import threading

import numpy as np
import pytest

gr = pytest.importorskip("grinnder", reason="the grinnder package is not installed (pip install .)")

# the CLI's defaults for Cora with dropout off, so that the runs compare bit for bit
SETTINGS = dict(epochs=6, dropout=0.0, hidden=16, feature_norm="row")
FLAGS = ["--epochs", "6", "--dropout", "0", "--hidden", "16", "--feature-norm", "row"]


def cli_losses(cli, tmp_path, dataset="data/cora", extra=()):
    m = tmp_path / "m.jsonl"
    cli("-q", "train", dataset, *FLAGS, *extra, "--metrics-out", m)
    lines = [json.loads(l) for l in open(m)]
    return [l["loss"] for l in lines if "final" not in l], lines[-1]


@pytest.fixture(scope="module")
def cora_ds():
    return gr.load_dataset("data/cora")


def test_a_file_trains_with_the_cli_losses_and_accuracy(grinnder, cora_ds, tmp_path):
    want, summary = cli_losses(grinnder, tmp_path)
    t = gr.Trainer(cora_ds, **SETTINGS)
    got = []
    s = t.fit(callback=lambda m: got.append(m["loss"]), progress=False)
    assert got == want
    assert s["test_acc"] == summary["test_acc"]


def test_arrays_and_pyg_data_give_the_files_losses(grinnder, cora, tmp_path):
    want, _ = cli_losses(grinnder, tmp_path)
    ds = gr.Dataset.from_arrays(cora["edge_index"], cora["x"], cora["y"], cora["train"], cora["valid"],
                                      cora["test"], name="cora")
    assert ds.features_borrowed, "float32 C-contiguous features are read in place"
    assert (ds.num_nodes, ds.num_features, ds.num_classes) == (2708, 1433, 7)
    got = []
    gr.Trainer(ds, **SETTINGS).fit(callback=lambda m: got.append(m["loss"]), progress=False)
    assert got == want
    torch = pytest.importorskip("torch")
    from torch_geometric.data import Data
    n = cora["x"].shape[0]
    mask = lambda idx: torch.zeros(n, dtype=torch.bool).index_fill_(0, torch.from_numpy(idx), True)
    data = Data(x=torch.from_numpy(cora["x"]), edge_index=torch.from_numpy(cora["edge_index"]),
                y=torch.from_numpy(cora["y"]), train_mask=mask(cora["train"]), val_mask=mask(cora["valid"]),
                test_mask=mask(cora["test"]))
    pyg = gr.Dataset.from_pyg(data)
    assert pyg.features_borrowed
    got = []
    gr.Trainer(pyg, **SETTINGS).fit(callback=lambda m: got.append(m["loss"]), progress=False)
    assert got == want


def test_defaults_follow_the_values_never_the_name(grinnder, cora, cora_ds, tmp_path):
    """The same arrays train alike through any door, whatever they are called: the default
    feature normalisation is row because no value is negative, not because of a folder's name."""
    settings = dict(epochs=3, dropout=0.0)
    want = []
    gr.Trainer(cora_ds, **settings).fit(callback=lambda m: want.append(m["loss"]), progress=False)
    for name in ("mine", "citeseer"):
        ds = gr.Dataset.from_arrays(cora["edge_index"], cora["x"], cora["y"], cora["train"], cora["valid"],
                                    cora["test"], name=name)
        got = []
        gr.Trainer(ds, **settings).fit(callback=lambda m: got.append(m["loss"]), progress=False)
        assert got == want, name
    # with a negative value the features are used as stored, as embeddings are
    x = cora["x"].copy()
    x[0, 0] = -1.0
    ds = gr.Dataset.from_arrays(cora["edge_index"], x, cora["y"], cora["train"], cora["valid"], cora["test"])
    t = gr.Trainer(ds, **settings)
    t.save(str(tmp_path / "m.safetensors"), which="last")
    from safetensors import safe_open
    with safe_open(str(tmp_path / "m.safetensors"), "np") as f:
        assert f.metadata()["feature_norm"] == "none"


def test_without_a_validation_split_the_last_epoch_is_reported_and_saved(cora, tmp_path):
    ds = gr.Dataset.from_arrays(cora["edge_index"], cora["x"], cora["y"], train_idx=cora["train"],
                                test_idx=cora["test"])
    t = gr.Trainer(ds, epochs=5, dropout=0.0)
    s = t.fit(progress=False)
    assert (s["best_epoch"], s["selected_by_valid"]) == (4, False)
    last = t.state_dict("last")
    for k, v in t.state_dict().items():
        np.testing.assert_array_equal(v, last[k], err_msg=k)
    note = t.save(str(tmp_path / "m.safetensors"))
    assert "after epoch 4" in note and "no validation split" in note
    # PyG's name for the validation split is read, and then the best epoch is selected
    v = np.zeros(cora["x"].shape[0], dtype=bool)
    v[cora["valid"]] = True
    ds = gr.Dataset.from_arrays(cora["edge_index"], cora["x"], cora["y"], train_idx=cora["train"],
                                test_idx=cora["test"], val_mask=v)
    assert gr.Trainer(ds, epochs=2).fit(progress=False)["selected_by_valid"]
    with pytest.raises(ValueError, match="valid_mask or val_mask"):
        gr.Dataset.from_arrays(cora["edge_index"], cora["x"], cora["y"], train_idx=cora["train"],
                               test_idx=cora["test"], val_mask=v, valid_mask=v)


def test_a_callback_returning_false_stops_fit(cora_ds):
    t = gr.Trainer(cora_ds, epochs=10)
    t.fit(callback=lambda m: m["epoch"] < 2, progress=False)
    assert t.epochs_done == 3
    t.fit(callback=lambda m: None, progress=False)  # None goes on
    assert t.epochs_done == 10


def test_patience_stops_fit_and_a_schedule_sets_each_epochs_rate(cora_ds):
    t = gr.Trainer(cora_ds, epochs=300, patience=5, lr_schedule="step", lr_step=10, lr_gamma=0.5)
    rates = []
    s = t.fit(callback=lambda m: rates.append(m["lr"]), progress=False)
    assert s["stopped_early"] and s["epochs"] == s["best_epoch"] + 6 < 300, s
    assert rates == [0.01 * 0.5 ** (e // 10) for e in range(s["epochs"])]


def test_predictions_equal_the_cli_predictions(grinnder, cora_ds, tmp_path):
    m = tmp_path / "m.safetensors"
    grinnder("-q", "train", *FLAGS, "--save-model", m)
    grinnder("-q", "predict", "--model-file", m, "--out", tmp_path / "out", "--embed", "0")
    t = gr.Trainer.load(str(m), cora_ds, parts=3)
    np.testing.assert_allclose(t.predict(), np.load(tmp_path / "out" / "logits.npy"), rtol=0, atol=1e-5)
    np.testing.assert_allclose(t.embed(0), np.load(tmp_path / "out" / "embedding-0.npy"), rtol=0, atol=1e-5)
    test = cora_ds.split("test")
    classes = t.predict(output="class", nodes=test)
    assert classes.shape == (1000,) and classes.dtype == np.int64
    # a trainer's own model, saved and read back
    tr = gr.Trainer(cora_ds, **SETTINGS)
    tr.fit(progress=False)
    path = tr.save(str(tmp_path / "own.safetensors"))
    assert "best validation" in path
    out = tr.predict(out=str(tmp_path / "p.npy"))
    np.testing.assert_array_equal(np.load(out), tr.predict())


def test_bad_inputs_raise_the_documented_exceptions(grinnder, cora, tmp_path):
    ei, x, y = cora["edge_index"], cora["x"], cora["y"]
    idx = dict(train_idx=cora["train"], valid_idx=cora["valid"], test_idx=cora["test"])
    bad = {
        "edge_index: expected shape [2, E]": dict(edge_index=ei.T.copy(), x=x, y=y, **idx),
        "node id 2708 is outside 0..2708": dict(edge_index=np.concatenate([ei, [[0], [2708]]], 1), x=x, y=y, **idx),
        "x: expected a 2-D array": dict(edge_index=ei, x=x[:, 0], y=y, **idx),
        "label of node 3 is -5": dict(edge_index=ei, x=x, y=np.where(np.arange(len(y)) == 3, -5, y), **idx),
        "2707 labels for 2708 nodes": dict(edge_index=ei, x=x, y=y[:-1], **idx),
        "feature of node 1, column 2 is NaN": dict(edge_index=ei, x=np.where(
            (np.arange(x.shape[0])[:, None] == 1) & (np.arange(x.shape[1]) == 2), np.nan, x).astype(np.float32),
            y=y, **idx),
        "test_idx: entry 1: node id 99999 is outside 0..2708": dict(edge_index=ei, x=x, y=y, train_idx=cora["train"], valid_idx=cora["valid"],
                         test_idx=np.array([5, 99999])),
        "in both the train and the valid split": dict(edge_index=ei, x=x, y=y, train_idx=cora["train"], valid_idx=cora["train"][:3],
                      test_idx=cora["test"]),
    }
    for want, args in bad.items():
        with pytest.raises(ValueError, match=want.replace("[", r"\[").replace("]", r"\]")):
            gr.Dataset.from_arrays(**args)
    with pytest.raises(OSError):
        gr.load_dataset(str(tmp_path / "missing"))
    # a class count above the labels' is kept; one below them is refused, named as the keyword
    assert gr.load_dataset("data/cora", num_classes=9).num_classes == 9
    with pytest.raises(ValueError, match="num_classes=5: the labels go up to 6"):
        gr.load_dataset("data/cora", num_classes=5)
    broken = tmp_path / "broken.grnd"
    broken.write_bytes(b"GRINNDER" + b"\0" * 100)
    with pytest.raises(ValueError):
        gr.load_dataset(str(broken))
    with pytest.raises(ValueError, match='did you mean "hidden"'):
        gr.Config(hiden=16)
    with pytest.raises(ValueError, match="--dropout must be in"):
        gr.Config(dropout=1.5)
    cfg = gr.Config(model="sage", host_mem="1GiB", parts=2, fanout=None)
    assert cfg.epochs == 200 and "model" in cfg.to_dict()
    assert set(gr.settings()) >= {"hidden", "host_mem", "storage_dir", "cache_dir", "parts", "device", "checkpoint_dir"}
    # names of choices in any case, as on the command line
    gr.Config(model="GraphSAGE", optimizer="Adam", feature_norm="Row")
    with pytest.raises(ValueError, match="model"):
        gr.Config(model="GCNN")


def test_cuda_is_an_exception_without_a_gpu_and_the_cpu_losses_with_one(grinnder, cora_ds):
    settings = dict(SETTINGS, epochs=2)
    try:
        t = gr.Trainer(cora_ds, device="cuda", **settings)
    except RuntimeError as e:
        assert "CUDA" in str(e)
        return
    # a GPU (the GPU machine runs these tests too): the CPU's losses, to float32 summation order
    cpu = gr.Trainer(cora_ds, **settings)
    for _ in range(2):
        assert t.train_epoch()["loss"] == pytest.approx(cpu.train_epoch()["loss"], rel=1e-4)


def test_ctrl_c_stops_fit_between_epochs_and_fit_goes_on_to_the_same_parameters(grinnder, cora_ds, request):
    settings = dict(SETTINGS, epochs=12)
    whole = gr.Trainer(cora_ds, **settings)
    whole.fit(progress=False)
    want = whole.state_dict("last")
    # an interrupt raised by the callback (the user's own code) ...
    t = gr.Trainer(cora_ds, **settings)

    def stop(m):
        if m["epoch"] == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        t.fit(callback=stop, progress=False)
    assert t.epochs_done == 4
    # ... and a real SIGINT while the engine works: sent from another thread a millisecond after
    # epoch 5 ends, so that it lands inside fit (during epoch 6 or just after it) however
    # loaded the machine is — a delay timed from a whole run's missed fit under load
    timers = []
    # Python's own SIGINT handler, as in an interactive session: a test runner started in the
    # background by a non-interactive shell inherits SIGINT ignored, and Python then installs none
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, previous))

    def interrupt_soon(m):
        if m["epoch"] == 5:
            timers.append(threading.Timer(0.001, lambda: os.kill(os.getpid(), signal.SIGINT)))
            timers[0].start()

    with pytest.raises(KeyboardInterrupt):
        t.fit(callback=interrupt_soon, progress=False)
    timers[0].join()
    assert 6 <= t.epochs_done < 12
    t.fit(progress=False)
    assert t.epochs_done == 12
    got = t.state_dict("last")
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
