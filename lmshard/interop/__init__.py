"""Interoperability with other trainers' token formats: `export_dataset` writes an lmshard
dataset as nanoGPT, llm.c, modded-nanogpt or Megatron-LM read it; `import_dataset` turns a
nanoGPT or Megatron-LM dataset into an lmshard one; `convert_dataset` rewrites an lmshard
dataset in another shard encoding. The layouts, and the anchor code each was checked against,
are in `layouts.py`; docs/interop.md has the table and a worked example per trainer."""

from .convert import ConvertResult, convert_dataset
from .export import ExportResult, export_dataset
from .importer import IMPORT_FORMATS, import_dataset
from .layouts import FORMATS

__all__ = ["FORMATS", "IMPORT_FORMATS", "ConvertResult", "ExportResult", "convert_dataset", "export_dataset",
           "import_dataset"]
