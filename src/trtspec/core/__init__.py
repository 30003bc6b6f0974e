"""What every layer shares: domain errors (no Click), acceptance metrics, model-folder facts, the output layout
and token-sequence helpers. Imports nothing from the rest of trtspec."""
