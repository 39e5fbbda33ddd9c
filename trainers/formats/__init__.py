"""The data a run reads: token files, tokenizers, text corpora, instruction and chat samples,
and what --data names. Imports no torch."""
