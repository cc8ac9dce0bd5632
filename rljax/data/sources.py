"""Rows from Hugging Face `datasets` and TensorFlow Datasets, for `RecordsTask`.

Both libraries are optional extras, imported only when one of these loaders runs.
TFDS is read through `tfds.data_source` (the array_record format), which needs neither
TensorFlow nor a network once the dataset is prepared. Errors name the config field.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

# Single data files that `datasets.load_dataset` reads with a packaged builder.
HF_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv",
                    ".arrow": "arrow"}


def _decoded(row: dict, columns: Sequence[str] | None) -> dict:
  row = {k: v for k, v in row.items() if columns is None or k in columns}
  return {k: (v.decode("utf-8") if isinstance(v, bytes) else v) for k, v in row.items()}


def _columns_to_keep(columns: Sequence[str] | None, available: Sequence[str]) -> Sequence[str] | None:
  """`columns` if all exist; else None (keep all, so a missing-field error lists them all)."""
  return columns if columns is not None and set(columns) <= set(available) else None


def _hf_from_disk(datasets, path: str, split: str):
  """A `save_to_disk` directory: a `Dataset` (used whole) or a `DatasetDict` (`split` picked)."""
  ds = datasets.load_from_disk(path)
  if isinstance(ds, datasets.DatasetDict):
    if split not in ds:
      raise ValueError(f"task.hf_split={split!r} is not a split of {path!r}: it has "
                       f"{sorted(ds)} (split slicing like 'train[:100]' needs a data file "
                       "or hub dataset, not a save_to_disk directory)")
    ds = ds[split]
  return ds


def load_hf_rows(path: str, *, split: str = "train", config: str = "",
                 columns: Sequence[str] | None = None) -> list[dict]:
  """Rows of a Hugging Face dataset.

  Args:
    path: (task.hf_path) a directory written by `Dataset[Dict].save_to_disk`, a single
      .json/.jsonl/.parquet/.csv/.arrow file, or anything `datasets.load_dataset` takes
      (a hub name such as "openai/gsm8k", a local dataset directory or script).
    split: (task.hf_split) e.g. "train", "test[:200]"; a saved single `Dataset` is used whole.
    config: (task.hf_config) the dataset's configuration name ("main" for GSM8K), or "".
    columns: keep only these columns (others, e.g. images, are not read) when all exist.
  Returns:
    list of dicts (str values decoded from bytes).
  Raises:
    ImportError: `datasets` is not installed. ValueError: unknown dataset, split or config,
      or an empty split, naming the config field.
  """
  try:
    import datasets
  except ImportError as e:
    raise ImportError("task.name='hf_dataset' needs Hugging Face `datasets`: "
                      "pip install 'rljax[hf-datasets]'") from e
  where = f"task.hf_path={path!r} (task.hf_config={config!r}, task.hf_split={split!r})"
  saved = any(os.path.isfile(os.path.join(path, f)) for f in ("dataset_dict.json", "state.json"))
  try:
    if os.path.isdir(path) and saved:
      ds = _hf_from_disk(datasets, path, split)
    elif os.path.isfile(path):
      builder = HF_FILE_BUILDERS.get(os.path.splitext(path)[1].lower())
      if builder is None:
        raise ValueError(f"task.hf_path={path!r}: a single file must end in "
                         f"{sorted(HF_FILE_BUILDERS)}")
      ds = datasets.load_dataset(builder, data_files=path, split=split)
    else:
      ds = datasets.load_dataset(path, config or None, split=split)
  except (FileNotFoundError, ConnectionError, datasets.exceptions.DatasetNotFoundError,
          datasets.exceptions.DatasetGenerationError) as e:
    raise ValueError(f"{where}: no such dataset, or it cannot be read: {e}") from e
  except ValueError as e:
    raise ValueError(f"{where}: {e}") from e
  if _columns_to_keep(columns, ds.column_names) is not None:
    ds = ds.select_columns(list(columns))
  if len(ds) == 0:
    raise ValueError(f"{where}: the split is empty")
  return [_decoded(row, None) for row in ds]


def load_tfds_rows(name: str, *, split: str = "train", data_dir: str = "",
                   columns: Sequence[str] | None = None) -> list[dict]:
  """Rows of a TFDS dataset read through `tfds.data_source` (array_record; no TensorFlow).

  Args:
    name: (task.tfds_name) "name", "name/config" or "name/config:version"; a catalog
      dataset that is not prepared yet is downloaded and prepared in array_record format.
    split: (task.tfds_split) e.g. "train", "test[:10%]".
    data_dir: (task.tfds_data_dir) where prepared datasets live; "" for TFDS's default.
    columns: keep only these top-level features when all exist.
  Returns:
    list of dicts (bytes decoded to str).
  Raises:
    ImportError: `tensorflow_datasets` (or `array_record`) is not installed. ValueError:
      unknown dataset or split, a dataset prepared as TFRecord, or an empty split.
  """
  try:
    import tensorflow_datasets as tfds
  except ImportError as e:
    raise ImportError("task.name='tfds' needs tensorflow-datasets and array-record: "
                      "pip install 'rljax[tfds]'") from e
  where = f"task.tfds_name={name!r} (task.tfds_split={split!r}, task.tfds_data_dir={data_dir!r})"
  try:
    source = tfds.data_source(name, split=split, data_dir=data_dir or None)
  except tfds.core.DatasetNotFoundError as e:
    raise ValueError(f"{where}: no such TFDS dataset (a custom builder must be imported or "
                     f"prepared under task.tfds_data_dir): {str(e).splitlines()[0]}") from e
  except NotImplementedError as e:
    raise ValueError(f"{where}: the dataset is prepared as TFRecord, which only TensorFlow "
                     "reads; prepare it as array_record instead (`tfds build NAME "
                     "--file_format=array_record`)") from e
  except (ValueError, AssertionError) as e:
    raise ValueError(f"{where}: {e}") from e
  if len(source) == 0:
    raise ValueError(f"{where}: the split is empty")
  columns = _columns_to_keep(columns, list(source.dataset_info.features.keys()))
  return [_decoded(source[i], columns) for i in range(len(source))]
