"""The EAGLE-3 draft family (chain drafting): model, training-time test, accuracy, checkpoint
writer, and the readers of every trainer's EAGLE-3 format (eyas/draft/__init__.py says how a
family plugs into the one loader)."""
