"""Type stub of grinnder's native module (crates/python): datasets, settings and the trainer."""

from os import PathLike
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import numpy as np
import numpy.typing as npt

__version__: str

ArrayLike = Any
"""A numpy array, a CPU torch tensor, or anything ``numpy.asarray`` takes."""

def load_dataset(
    path: Union[str, PathLike],
    *,
    format: str = "auto",
    split: Optional[str] = None,
    non_finite: str = "refuse",
    num_nodes: Optional[int] = None,
    igb_classes: int = 19,
    skip_feature_checksums: bool = False,
    allow_split_overlap: bool = False,
    num_classes: Optional[int] = None,
    directed: bool = False,
) -> "Dataset":
    """Load a dataset as ``grinnder train DATASET`` does.

    Parameters
    ----------
    path
        A ``.grnd`` file, an OGB node-property folder, an IGB folder or an npy exchange folder,
        recognised by its content.
    format
        "auto", or force one of "native", "ogb", "igb", "npy".
    split
        The OGB split folder to use where there are several.
    non_finite
        NaN or infinite features: "refuse" (default) or "report" (keep them, logged).
    num_nodes, igb_classes
        IGB: the node count for headerless feature files; 19 or 2983 classes.
    skip_feature_checksums
        Native files: do not verify the feature sections (features far larger than RAM).
    allow_split_overlap
        Accept splits that share nodes (warned about) instead of refusing them.
    num_classes
        The class count, where the labels do not reach the last class (default: the largest
        label + 1; classes without a node are warned about).
    directed
        Take the edges as given (``--directed``): each node aggregates over its in-neighbours
        (PyG's flow, source to target), no symmetrisation. An npy folder's ``edge_weight.npy``
        gives edge weights either way.

    Raises
    ------
    OSError
        The file cannot be read.
    ValueError
        Its content is wrong; the message names the file and the line or byte offset.
    """

def settings() -> Dict[str, str]:
    """Every keyword ``Config`` takes, with its help text (the CLI's ``--help`` for the flag)."""

class Dataset:
    """A graph with node features, labels and train/valid/test splits, as grinnder trains on it."""

    features_borrowed: bool
    """Whether the features are read in place from the caller's array (no copy)."""

    @staticmethod
    def from_arrays(
        edge_index: ArrayLike,
        x: ArrayLike,
        y: Optional[ArrayLike] = None,
        train_idx: Optional[ArrayLike] = None,
        valid_idx: Optional[ArrayLike] = None,
        test_idx: Optional[ArrayLike] = None,
        *,
        train_mask: Optional[ArrayLike] = None,
        valid_mask: Optional[ArrayLike] = None,
        test_mask: Optional[ArrayLike] = None,
        val_idx: Optional[ArrayLike] = None,
        val_mask: Optional[ArrayLike] = None,
        num_classes: Optional[int] = None,
        name: str = "arrays",
        non_finite: str = "refuse",
        allow_split_overlap: bool = False,
        edge_weight: Optional[ArrayLike] = None,
        directed: bool = False,
    ) -> "Dataset":
        """A dataset from arrays.

        Parameters
        ----------
        edge_index
            int [2, E]: source then target of every edge messages use; made symmetric, without
            self loops and duplicates, as OGB's loaders do (``directed=True``: taken as given,
            each node aggregating over its in-neighbours, PyG's flow source to target).
        edge_weight
            float [E]: one weight per edge, finite and not negative (PyG's ``edge_weight``);
            GCN uses it as PyG's ``gcn_norm`` does, the other models refuse it. Copies of an
            edge (and, made symmetric, an edge and its reverse) are one edge and must carry one
            weight (merge them first: ``torch_geometric.utils.coalesce(edge_index,
            edge_weight, reduce="sum")``).
        x
            float [N, F]. Read in place when it is a C-contiguous float32 array (a CPU float32
            tensor is one): keep it unchanged while the dataset lives. Anything else is
            converted once (``numpy.ascontiguousarray(x, dtype=float32)``).
        y
            int [N] (or [N, 1]); -1 or NaN for no label. None: no labels (a graph to predict
            on; give ``num_classes``).
        train_idx, valid_idx, test_idx
            Node ids of the splits; or ``train_mask`` etc., boolean [N]. The validation split
            under PyG's names too (``val_mask``, ``val_idx``). Without one, the last epoch is
            the one a trainer reports and saves (it says so).
        name
            A label for messages; it changes nothing in training (the default feature
            normalisation is decided by the values: row where none is negative).

        Raises
        ------
        ValueError
            Bad shapes, ids out of range, NaN features (unless ``non_finite="report"``),
            labels out of range, splits that share nodes (unless ``allow_split_overlap``); the
            message names the argument and the entry.
        """

    @staticmethod
    def from_pyg(
        data: Any,
        *,
        num_classes: Optional[int] = None,
        name: str = "pyg",
        non_finite: str = "refuse",
        allow_split_overlap: bool = False,
        directed: bool = False,
    ) -> "Dataset":
        """A dataset from a PyG ``Data`` (duck-typed: ``edge_index``, ``x``, ``y`` and
        ``train_mask``/``val_mask``/``test_mask`` or ``train_idx``/``valid_idx``/``test_idx``,
        and ``edge_weight`` where it has one), by the rules of ``from_arrays``."""

    @property
    def name(self) -> str: ...
    @property
    def num_nodes(self) -> int: ...
    @property
    def num_edges(self) -> int:
        """Directed edges as held: after symmetrisation each undirected edge counts twice."""
    @property
    def directed(self) -> bool:
        """Whether the edges were taken as given (``directed=True``), not made symmetric."""
    @property
    def num_features(self) -> int: ...
    @property
    def num_classes(self) -> int: ...
    @property
    def split_sizes(self) -> Tuple[int, int, int]:
        """(train, valid, test) sizes."""
    def split(self, which: str) -> npt.NDArray[np.int64]:
        """The node ids of "train", "valid" or "test"."""
    def labels(self) -> npt.NDArray[np.int32]:
        """One label per node, -1 where none."""
    def edge_index(self) -> npt.NDArray[np.int64]:
        """Every directed edge as PyG's ``edge_index`` [2, E] (symmetric unless ``directed``, no
        self loops or duplicates): what PyG must be given to compute grinnder's logits."""
    def edge_weight(self) -> Optional[npt.NDArray[np.float32]]:
        """The edge weights aligned with ``edge_index()`` (float32 [E]); None: unweighted."""
    def features(self) -> npt.NDArray[np.float32]:
        """The node features [N, F] (a copy)."""

class Config:
    """Validated settings of a run.

    Keywords are the ``grinnder train`` flags with ``_`` for ``-`` and the keys of its TOML
    ``--config`` files (``grinnder.settings()`` lists them): ``model="gcn"``, ``layers=2``,
    ``hidden=256``, ``dropout=0.5``, ``epochs=200``, ``optimizer="adam"``, ``lr=0.01``,
    ``device="cuda"``, ``parts=16``, ``host_mem="8GiB"``, ``storage_dir="/nvme/tmp"``,
    ``gpu_mem="24GiB"``, ``mode="minibatch"``, ``fanout=[15, 10]``, … and the checkpoint flags
    ``checkpoint_dir``, ``checkpoint_every``, ``checkpoint_keep``, ``resume``, ``init_from``.
    Sizes may be numbers of bytes or text ("8GiB").

    Raises
    ------
    ValueError
        An unknown keyword (naming the closest known one) or a value the CLI would refuse.
    """

    def __init__(self, **settings: Any) -> None: ...
    def to_dict(self) -> Dict[str, str]:
        """The keywords given (their Python repr)."""
    @property
    def epochs(self) -> int:
        """Epochs ``fit`` trains."""

Figures = Dict[str, Any]

class Trainer:
    """Trains a GNN on a ``Dataset``, an epoch at a time.

    ``Trainer(dataset, config)`` or ``Trainer(dataset, **settings)`` sets training up (in memory,
    or layer by layer and partition by partition over a tiered store with ``parts``,
    ``host_mem``, ``storage_dir``, ``gpu_mem``; mini-batches with ``mode="minibatch"``). The
    GIL is released while the engine works. ``host_mem`` budgets the whole process: the
    interpreter, numpy and torch count against it too. ``block_cache="0"`` keeps no block in
    host memory (every block through ``storage_dir``: a way to try the storage tier on a small
    graph).

    Raises
    ------
    ValueError
        Settings or a dataset the engine refuses (a host budget too small names the least that
        would do).
    RuntimeError
        ``device="cuda"`` without a usable GPU, or what fails while running.
    OSError
        Storage and checkpoint files.
    """

    def __init__(self, dataset: Dataset, config: Optional[Config] = None, **settings: Any) -> None: ...
    @staticmethod
    def load(path: Union[str, PathLike], dataset: Dataset, **settings: Any) -> "Trainer":
        """A trainer holding a model file's model (``Trainer.save``, ``grinnder train
        --save-model``, or a PyG model saved with safetensors), to predict on ``dataset`` (any
        graph of the model's feature width). ``settings`` set how it runs: ``parts``,
        ``host_mem``, ``storage_dir``, ``device``, ``gpu_mem``. A file that cannot be read
        raises ``OSError``; a dataset the model does not fit (another feature width, more
        classes, another direction, weights it was not trained with) ``ValueError``, naming
        the fix."""
    def train_epoch(self) -> Figures:
        """Train one epoch; its figures: ``epoch`` (counted from 0: the first call's is 0, and
        ``epochs_done`` is then 1), ``loss``, ``epoch_s``, ``eval_s``, ``train_acc``/
        ``valid_acc``/``test_acc`` on evaluated epochs, time per phase and bytes per tier where
        the mode has them (``gather_s``, ``storage_read_bytes``, …), ``peak_host_bytes``, and
        ``peak_device_bytes`` on a GPU only. Prints nothing: log from your loop, or use ``fit``."""
    def evaluate(self) -> Figures:
        """Accuracies of the current parameters: ``train_acc``, ``valid_acc``, ``test_acc``,
        with ``eval_s`` and ``epoch`` (the last epoch trained)."""
    def fit(
        self,
        epochs: Optional[int] = None,
        callback: Optional[Callable[[Figures], Any]] = None,
        progress: bool = True,
    ) -> Figures:
        """Train ``epochs`` more epochs (default: up to the configured number), calling
        ``callback(figures)`` after each; a callback returning ``False`` stops training there
        (early stopping; ``None`` goes on). Ctrl-C stops after the epoch under way, the trainer
        intact (``fit`` again goes on as if never stopped). Returns ``summary()``."""
    def summary(self) -> Figures:
        """``test_acc`` at the best validation epoch (``best_epoch``, ``best_valid_acc``;
        ``selected_by_valid`` False: the dataset has no validation split and these are the last
        epoch's), ``final_loss``, ``epoch_s_median``, peak memory."""
    @property
    def epochs_done(self) -> int: ...
    @property
    def dataset(self) -> Dataset: ...
    def predict(
        self,
        output: str = "logits",
        nodes: Optional[ArrayLike] = None,
        out: Optional[Union[str, PathLike]] = None,
        dtype: str = "float32",
    ) -> Union[npt.NDArray[np.float32], npt.NDArray[np.int64], str]:
        """Predictions for every node, or ``nodes`` (ids or a boolean mask; rows in their order).

        ``output``: "logits" or "probs" ([rows, classes] float32) or "class" ([rows] int64).
        With ``out="file.npy"`` the rows are written there as they are computed (outputs larger
        than memory; ``dtype="bfloat16"`` stores bfloat16 bit patterns as uint16) and the path is
        returned. Computed as the trainer trains: in memory, or partition by partition under its
        budgets."""
    def embed(
        self,
        layer: int,
        nodes: Optional[ArrayLike] = None,
        out: Optional[Union[str, PathLike]] = None,
        dtype: str = "float32",
    ) -> Union[npt.NDArray[np.float32], str]:
        """Hidden layer ``layer``'s output (0-based; after its norm, ReLU and residual), as
        ``predict`` gives logits."""
    def save(self, path: Union[str, PathLike], which: str = "best") -> str:
        """Write the model as safetensors with PyG's names (docs/model-files.md): the best
        validation epoch's parameters ("best") or the last ("last"); returns which."""
    def state_dict(self, which: str = "best") -> Dict[str, npt.NDArray[np.float32]]:
        """The parameters under PyG's names and shapes, for ``load_state_dict``: those ``save``
        writes, the best validation epoch's (``"best"``, the epoch ``summary()`` reports; the
        last epoch's where the dataset has no validation split) or the last ones (``"last"``)."""
    def save_checkpoint(self) -> None:
        """Write a checkpoint now (needs ``checkpoint_dir``)."""

class _LayerwiseRun:
    """The tiered executor over a torch model's layers (used by `grinnder.torch.Trainer`)."""

    def __init__(self, dataset: Dataset, driver: Any, dims: List[int], adjacency: str = "gcn", **settings: Any) -> None: ...
    def train_pass(self, epoch: int, criterion: Any) -> float: ...
    def predict(self, upto: Optional[int] = None) -> np.ndarray: ...
    @property
    def parts(self) -> int: ...
    @property
    def storage_dir(self) -> Optional[str]: ...
    @property
    def storage_ops(self) -> Tuple[int, int]: ...
