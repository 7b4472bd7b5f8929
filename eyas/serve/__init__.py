"""Serving: boot an engine with the target (and a draft), measure acceptance and speed, and
capture the hidden states the engine really computes. Engine imports stay inside functions:
eyas imports without any serving engine installed."""
