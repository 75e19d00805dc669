"""Integrations beside the library: sbd's drafts inside other engines (`vllm/`). Nothing in sbd imports
them; each imports its engine only inside its own package."""
