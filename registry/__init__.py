"""Name -> class registries, loaded on first use: one machine for every plugin family
(reasoning parsers, tool-call formats, model runners).

It sits at the bottom of the import graph: it imports nothing of ours, and every
package may use it.
"""

from .lazy import Registry, UnknownNameError, load_plugin

__all__ = ["Registry", "UnknownNameError", "load_plugin"]
