"""Command-line programs built on saver/ and kv/ (not shipped in the wheel)."""
