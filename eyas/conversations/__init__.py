"""Chat data: reading conversation files (`records`), tokenizing them for the target
(`prepare`)."""
