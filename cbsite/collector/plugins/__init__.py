"""Plugins: providers, preprocessors, profilers and reporters, discovered through entry points.

Write a profiler plugin by subclassing `Profiler` (or implementing `ProfilerPlugin`) and registering
it under the `cbsite.profilers` entry point group of your package; see docs-notes/plugins.md.
"""

from cbsite.collector.plugins.base import (
    Option,
    PhaseContext,
    PluginResult,
    PreprocessorPlugin,
    Profiler,
    ProfilerPlugin,
    ProviderPlugin,
    ReporterPlugin,
    RunContext,
)
from cbsite.collector.plugins.registry import Selection, available, load, select

__all__ = [
    "Option", "PhaseContext", "PluginResult", "PreprocessorPlugin", "Profiler", "ProfilerPlugin",
    "ProviderPlugin", "ReporterPlugin", "RunContext", "Selection", "available", "load", "select",
]
