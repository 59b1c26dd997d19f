"""Text corpora as a training task (numpy + Hugging Face `tokenizers`, no torch).

Contract:
- `read_corpus(paths)`: the documents (one per file) named by files, folders and globs. A folder
  is walked recursively; hidden entries, `__pycache__` and installed third-party packages
  (`site-packages`) are not. A file is text when it decodes as UTF-8 and holds no NUL byte; a
  folder's other files are skipped, a binary file named on its own is refused. A missing path,
  a folder or glob with no text and an empty corpus are refused (`CorpusError`). The corpus
  record holds the root, every file (relative to the root, sorted) and the sha256 of names and
  contents, so a run can be repeated and a changed corpus is noticed (`corpus_from_record`).
- Split: a document belongs to validation when the sha256 of its content, mod 100, is below
  `val_percent` (default 5): fixed per document, whatever the seed or the file order.
- `TextTask(corpus, tokenizer, seq_len)`: each split's documents tokenized and joined by
  `<|endoftext|>` into one stream, on the split's first use (`split_stream`), which refuses a
  split shorter than one sequence: an evaluation reads the validation split alone, a twentieth
  of the corpus, and training asks for both before its first step. `sample(split, n, seed)`
  draws n windows of seq_len + 1 tokens at seeded random starts: the inputs and their
  next-token targets.
- `score(predictions, targets, inputs)`: next-token accuracy over every position, at the copy
  positions (`copy_positions`: the last COPY_NGRAM tokens repeat an n-gram that ended earlier in
  the same window, where an induction head can copy what followed) and at all the others.
"""

from __future__ import annotations

import glob
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from psa_edge.errors import CorpusError, TaskError

SKIPPED_DIRS = {"__pycache__", "site-packages", "dist-packages"}
COPY_NGRAM = 2
VAL_PERCENT = 5


@dataclass(frozen=True)
class Corpus:
    root: str
    files: tuple[str, ...]
    texts: tuple[str, ...] = field(repr=False)
    sha256: str = ""

    @property
    def record(self) -> dict:
        return {"root": self.root, "files": list(self.files), "sha256": self.sha256,
                "documents": len(self.files), "bytes": sum(len(t.encode()) for t in self.texts)}

    def split(self, name: str, val_percent: int = VAL_PERCENT) -> list[str]:
        """The documents of split `train` or `test` (validation)."""
        want = name == "test"
        return [t for t in self.texts
                if (int(hashlib.sha256(t.encode()).hexdigest(), 16) % 100 < val_percent) == want]


def read_text(path: Path) -> str | None:
    """The file's text, or None when it is not UTF-8 text (undecodable, or a NUL byte)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CorpusError(f"cannot read {path}: {exc.strerror}")
    if b"\x00" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def walk(folder: Path):
    for path in sorted(folder.iterdir()):
        if path.name.startswith(".") or path.name in SKIPPED_DIRS:
            continue
        if path.is_dir():
            yield from walk(path)
        elif path.is_file():
            yield path


def check_corpus_path(spec: str) -> None:
    """Refuse a corpus argument that is neither a path that exists nor a glob pattern."""
    if not Path(spec).exists() and not glob.has_magic(spec):
        raise CorpusError(f"{spec} does not exist")


def read_corpus(paths) -> Corpus:
    found: dict[Path, str] = {}
    for spec in map(str, paths):
        check_corpus_path(spec)
        path = Path(spec)
        if path.is_file():
            text = read_text(path)
            if text is None:
                raise CorpusError(f"{path} is not a UTF-8 text file")
            found[path.resolve()] = text
            continue
        matches = list(walk(path)) if path.is_dir() else [
            Path(m) for m in sorted(glob.glob(spec, recursive=True)) if Path(m).is_file()]
        texts = {p.resolve(): t for p in matches if (t := read_text(p)) is not None}
        if not texts:
            raise CorpusError(f"{spec} holds no text file")
        found.update(texts)
    found = {p: t for p, t in found.items() if t.strip()}
    if not found:
        raise CorpusError("the corpus is empty: no file holds any text")
    names = sorted(found)
    root = Path(os.path.commonpath([str(p.parent) for p in names]))
    files = tuple(str(p.relative_to(root)) for p in names)
    digest = hashlib.sha256()
    for name, path in zip(files, names):
        digest.update(name.encode() + b"\0" + found[path].encode() + b"\0")
    return Corpus(str(root), files, tuple(found[p] for p in names), digest.hexdigest())


def corpus_from_record(record: dict) -> Corpus:
    """The corpus a model recorded, read again; refused when a file is gone or changed."""
    root = Path(record["root"])
    missing = [f for f in record["files"] if not (root / f).is_file()]
    if missing:
        raise CorpusError(f"the recorded corpus is not on this machine ({root / missing[0]} "
                          f"is missing)")
    corpus = read_corpus([root / f for f in record["files"]])
    if corpus.sha256 != record["sha256"]:
        raise CorpusError(f"the corpus under {root} has changed since the model was trained "
                          f"(sha256 {corpus.sha256[:12]}..., recorded "
                          f"{record['sha256'][:12]}...)")
    return corpus


def copy_positions(inputs: np.ndarray, n: int = COPY_NGRAM) -> np.ndarray:
    """`[rows, T]` bool: position t ends an n-gram `inputs[t-n+1..t]` that also ended at an
    earlier position of the same row."""
    rows, length = inputs.shape
    out = np.zeros((rows, length), dtype=bool)
    if length < n:
        return out
    base = int(inputs.max()) + 1
    keys = np.zeros((rows, length - n + 1), dtype=np.int64)
    for k in range(n):
        keys = keys * base + inputs[:, k:length - n + 1 + k]
    for r in range(rows):
        _, first, inverse = np.unique(keys[r], return_index=True, return_inverse=True)
        out[r, n - 1:] = first[inverse] < np.arange(keys.shape[1])
    return out


class TextTask:
    name = "text"

    def __init__(self, corpus: Corpus, tokenizer, seq_len: int, val_percent: int = VAL_PERCENT):
        if seq_len < 8:
            raise TaskError(f"text needs --seq-len >= 8, got {seq_len}")
        if tokenizer.eos_id is None:
            raise TaskError("a text model needs a tokenizer with <|endoftext|>")
        self.corpus, self.tokenizer = corpus, tokenizer
        self.seq_len, self.val_percent = seq_len, val_percent
        self.vocab_size = tokenizer.vocab_size
        self.chance = 1 / tokenizer.vocab_size
        self.streams: dict[str, np.ndarray] = {}

    @property
    def params(self) -> dict:
        return {"seq_len": self.seq_len, "val_percent": self.val_percent,
                "corpus": self.corpus.record}

    def to_dict(self) -> dict:
        return {"name": self.name, "params": self.params}

    def stream(self, documents: list[str]) -> np.ndarray:
        """The documents' tokens, each followed by <|endoftext|>."""
        if not documents:
            return np.zeros(0, np.int32)
        eos, parts = [self.tokenizer.eos_id], []
        for start in range(0, len(documents), 64):  # bounded: an encoding holds far more
            batch = documents[start:start + 64]     # than its ids
            parts += [np.array(e.ids + eos, np.int32) for e in
                      self.tokenizer.hf.encode_batch_fast(batch, add_special_tokens=False)]
        return np.concatenate(parts)

    def split_stream(self, split: str) -> np.ndarray:
        """The split's tokens, tokenized on its first use."""
        if split not in ("train", "test"):
            raise TaskError(f"unknown split {split!r}; choose train or test")
        if split not in self.streams:
            stream = self.stream(self.corpus.split(split, self.val_percent))
            if stream.size < self.seq_len + 1:
                raise CorpusError(f"the corpus's {'validation' if split == 'test' else split} "
                                  f"split has {stream.size} tokens, fewer than one sequence of "
                                  f"{self.seq_len + 1}: give more text or a shorter --seq-len")
            self.streams[split] = stream
        return self.streams[split]

    def sample(self, split: str, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        stream = self.split_stream(split)
        rng = np.random.default_rng([seed, ("train", "test").index(split), 0x7E57])
        starts = rng.integers(0, stream.size - self.seq_len, size=n)
        windows = stream[starts[:, None] + np.arange(self.seq_len + 1)].astype(np.int64)
        return windows[:, :-1], windows[:, 1:]

    def score(self, predictions: np.ndarray, targets: np.ndarray, inputs: np.ndarray) -> dict:
        correct = predictions == targets
        copy = copy_positions(inputs)
        return {"accuracy": float(correct.mean()), "last_accuracy": float(correct[:, -1].mean()),
                "copy_accuracy": float(correct[copy].mean()) if copy.any() else 0.0,
                "other_accuracy": float(correct[~copy].mean()) if (~copy).any() else 0.0,
                "copy_positions": float(copy.mean()), "scored_positions": int(correct.size)}
