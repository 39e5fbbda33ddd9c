"""Commands around a run: prepare data, train a tokenizer, sample, export, plot; and what only
they use (decoding, a run's model rebuilt in one process, the Hugging Face export)."""
