"""Batch segmentation on a Ray cluster with Ray Data: ``sapiens_seg.ray``.

For datasets that outgrow one machine. Ray Data schedules the work (actors, retries, back
pressure, progress); this module only supplies the per-actor model and the per-batch function::

    import ray
    from sapiens_seg.ray import segment_dataset

    ray.init()                                                   # or ray.init(address="auto")
    ds = ray.data.read_binary_files("s3://bucket/photos/", include_paths=True)
    out = segment_dataset(ds, "sapiens-seg-0.3b-goliath", accept_noncommercial=True,
                          output="s3://bucket/labels/", return_labels=False, batch_size=8,
                          concurrency=4, num_gpus=1)
    out.write_parquet("s3://bucket/stats/")                      # per-image stats and errors

or, with the class directly::

    ds.map_batches(SapiensSegmenter, fn_constructor_args=("sapiens-seg-0.3b-goliath",),
                   fn_constructor_kwargs={"accept_noncommercial": True}, batch_size=8,
                   batch_format="numpy", compute=ray.data.ActorPoolStrategy(size=4), num_gpus=1)

``python -m sapiens_seg.ray INPUT... -o OUT`` (also installed as ``sapiens-seg-ray``) does the
whole job for a folder, a list file or object-store URIs; see :func:`main`.

Inputs (one row per image), in this order of preference:

* ``image``: an ``HxWx3`` uint8 RGB array, as ``ray.data.read_images(..., mode="RGB")`` makes
  (grey ``HxW`` and ``HxWx4`` arrays are accepted: grey replicated, alpha dropped). Note that
  Ray decodes these with PIL, which does not apply EXIF orientation: for labels identical to the
  ``sapiens-seg`` CLI use one of the next two.
* ``bytes``: encoded image bytes, as ``ray.data.read_binary_files(..., include_paths=True)``
  makes; decoded by the library exactly as the CLI decodes files.
* ``path``: a local path (readable on every node: a shared file system) or a URI that
  ``pyarrow.fs`` understands (``s3://``, ``gs://``, ``hdfs://``, ...); the actor reads it.

Outputs: the input's columns (less ``image`` and ``bytes``) plus

* ``labels``: uint8 ``[H, W]`` class indices (unless ``return_labels=False``);
* ``height``, ``width``;
* ``class_pixels``: a struct of pixel counts, one field per class name (``Background``, ...);
* ``class_fraction``: the same as fractions of the image's pixels;
* ``labels_png``: where the label PNG was written (with ``output=``), else null;
* ``error``, ``error_code``: null for a segmented image; for one that failed (corrupt, too
  small, unreadable) the message and the library's code (``invalid_input``, ``not_found``,
  ``io_error``, ...). A bad image fails its row, never the job.

Label PNGs are 8-bit grey, value = class index: byte for byte the CLI's ``--save labels``
files (the same OpenCV encoder, through the binding). They are named ``<name>_seg.png``, where
``name`` is the row's ``name`` column when there is one, else the input's file stem (with
``root=``: its path relative to ``root``, sub-folders kept); inputs whose stems collide need a
``name`` column (the command makes one with the CLI's rule, :func:`output_names`). Every
file is written to a temporary name and renamed (local folders) or uploaded whole (object
stores), so a batch that Ray retries after an actor crash rewrites the same files with the same
bytes, and no partial file is ever visible.

Weights: each actor loads the model once, in its constructor, through the library's weight store
(``SAPIENS_SEG_WEIGHTS_PATH``, the cache in ``SAPIENS_SEG_HOME``, the Hugging Face cache, else a
download; see the README). The store takes a lock file next to the download, so when several
actors on one node start together the first one downloads and verifies the file while the
others wait for it and then use the verified file: one download per node (per cache folder; a
cache on a shared file system makes it one per cluster). Nodes are not coordinated by this
module: to avoid any download at run time, place the file on every node, or in a shared
``SAPIENS_SEG_WEIGHTS_PATH``, beforehand (``sapiens-seg models download ID``).

Devices: an actor given GPUs by Ray (``num_gpus=``) runs on the first of them (Ray sets
``CUDA_VISIBLE_DEVICES``; :func:`ray.get_gpu_ids` says which), any other actor on the CPU with
as many LibTorch threads as Ray gave it CPUs. Pass ``device=`` to override.

Failures: a crashed actor (killed, out of memory, a lost node) is restarted by Ray and its
batches are retried (``max_restarts``, ``max_task_retries``); results do not depend on batch
size, actor count or retries, and equal the CLI's for the same model and options.
"""

from __future__ import annotations

try:
    import ray  # noqa: F401
    import ray.data  # noqa: F401 - Ray Data, not only Ray core
except ImportError as _e:  # pragma: no cover - depends on the environment
    raise ImportError("sapiens_seg.ray needs Ray Data: pip install 'ray[data]'") from _e

from ._command import main, output_names
from ._segmenter import LABELS_SUFFIX, SapiensSegmenter, segment_dataset

__all__ = ["SapiensSegmenter", "segment_dataset", "output_names", "main", "LABELS_SUFFIX"]
