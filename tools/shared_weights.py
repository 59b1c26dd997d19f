"""Two ONNX Runtime sessions over one copy of the weights: the shipped graph and its
decode-only counterpart (tools/overhead_candidates.py's "shared decode-only" candidate).

`open_shared(shipped, decode_only, prepack)` gives each initializer of the decode-only graph
that equals one of the shipped graph's in content (their names differ between two exports) the
same OrtValue (`SessionOptions.add_initializer`). With `prepack` off (the default) both sessions
read those weights as they are; with it on, each session also packs its own copy for its
MatMuls, as a session with its own weights does (it then frees the originals, which shared
ones it cannot). Only numpy, onnx, onnxruntime and psa-edge's torch-free runtime are imported
(no torch), so that

    python tools/shared_weights.py FEEDS.npz MODE SHIPPED.onnx DECODE_ONLY.onnx

prints, from a fresh process, the resident bytes the sessions hold after a one-token step,
MODE one of `alone` (the shipped graph's session as psa-edge opens it), `shared` and
`shared-prepacked` (the pair).
"""

from __future__ import annotations

import ctypes
import gc
import hashlib
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper


def weights(path: str) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}


def content(array: np.ndarray) -> tuple:
    return array.shape, array.dtype.str, hashlib.sha1(array.tobytes()).hexdigest()


def open_shared(shipped: str, decode_only: str, prepack: bool = False) -> tuple:
    """(shipped session, decode-only session, what the sessions read: keep it alive,
    (initializers shared, initializers of the decode-only graph))."""
    # np.require keeps 0-d constants 0-d (np.ascontiguousarray would make them 1-d).
    arrays = {name: np.require(a, requirements="C") for name, a in weights(shipped).items()}
    by_content = {content(a): name for name, a in arrays.items()}
    values = {name: ort.OrtValue.ortvalue_from_numpy(a) for name, a in arrays.items()}
    matched = {name: by_content.get(content(a)) for name, a in weights(decode_only).items()}
    sessions = []
    for path, given in ((shipped, values),
                        (decode_only, {n: values[m] for n, m in matched.items() if m})):
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.log_severity_level = 1, 3
        if not prepack:
            options.add_session_config_entry("session.disable_prepacking", "1")
        for name, value in given.items():
            options.add_initializer(name, value)
        sessions.append(ort.InferenceSession(path, options, providers=["CPUExecutionProvider"]))
    counts = (sum(m is not None for m in matched.values()), len(matched))
    return sessions[0], sessions[1], (arrays, values), counts


def resident() -> int:
    """Resident bytes after returning freed heap to the system (glibc), so that what loading
    the weights left freed does not count."""
    from psa_edge.runtime.bench import rss_bytes

    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return rss_bytes()


def main() -> None:
    feeds_file, mode, shipped, decode_only = sys.argv[1:5]
    feeds = dict(np.load(feeds_file))
    before = resident()
    if mode == "alone":
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        kept = ort.InferenceSession(shipped, options, providers=["CPUExecutionProvider"])
        kept.run(None, feeds)
    else:
        kept = open_shared(shipped, decode_only, prepack=mode == "shared-prepacked")
        kept[0].run(None, feeds)
        kept[1].run(None, feeds)
    print(resident() - before)


if __name__ == "__main__":
    main()
