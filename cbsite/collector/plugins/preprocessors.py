"""The built-in preprocessing steps as preprocessor plugins (entry points `shrink-hash`, `replicate-batch`).

`--shrink-factor`, `--shrink-cap` and `--batch-size` select these same plugins; `--plugin shrink-hash
--plugin-option shrink-hash.cap=100000` (or the configuration file) does too.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from cbsite.collector.plugins.base import Option
from cbsite.collector.preprocess import replicate_batch, shrink_hash_sizes
from cbsite.collector.providers import Inputs


class ShrinkHash:
    name = "shrink-hash"
    description = "shrink torchrec embedding tables (hash sizes) and remap ids into range"
    options = {
        "factor": Option(None, "divide every table's rows by this", kind=(int, float)),
        "cap": Option(None, "cap every table at this many rows", kind=int),
    }

    def __init__(self, options: dict[str, Any]) -> None:
        self.opts = options

    def apply(self, model: nn.Module, inputs: list[Inputs]) -> tuple[nn.Module, list[Inputs], dict[str, Any]]:
        return shrink_hash_sizes(model, inputs, factor=self.opts.get("factor"), cap=self.opts.get("cap"))


class ReplicateBatch:
    name = "replicate-batch"
    description = "grow the example batch to a target batch size by repeating it"
    options = {"batch_size": Option(None, "target batch size", kind=int)}

    def __init__(self, options: dict[str, Any]) -> None:
        self.opts = options

    def apply(self, model: nn.Module, inputs: list[Inputs]) -> tuple[nn.Module, list[Inputs], dict[str, Any]]:
        from cbsite.errors import CbsiteError

        if self.opts.get("batch_size") is None:
            raise CbsiteError("replicate-batch needs its batch_size option, e.g. --plugin-option replicate-batch.batch_size=4096")
        inputs, record = replicate_batch(inputs, self.opts["batch_size"])
        return model, inputs, record
