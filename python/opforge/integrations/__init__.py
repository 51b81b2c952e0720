"""Model patches that route a model's norms and gated MLPs through opforge's ops.

Each integration imports its framework only when used (``opforge.patch`` loads the transformers
one on first access), so ``import opforge`` never imports transformers.
"""
