"""Chat data: reading conversation files (`records`) and tokenizing them for the target (`prepare`)."""
