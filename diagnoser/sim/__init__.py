"""A model of a vLLM server whose metrics follow from its mechanics (see engine.py)."""
