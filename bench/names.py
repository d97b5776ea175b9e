"""The benchmarks' vocabularies and grammar mixes, by name (kept apart from
`bench.states` so that the command line can list them without importing the
grammar compiler)."""

VOCABS = ("qwen3", "o200k_harmony")
GRAMMARS = ("one_tool_schema", "required_8_tools", "hermes_tag", "builtin_json")
#: `thinkgate bench sample`: the mixes of sampling settings, and the shapes of logits
MIXES = ("plain", "top_k", "top_p", "mixed")
LOGITS = ("normal", "peaked")
