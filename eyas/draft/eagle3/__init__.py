"""The EAGLE-3 draft family (chain drafting): its model and the readers of every trainer's
EAGLE-3 format; the objective, accuracy and checkpoint writer it shares with every family are
eyas/draft's (eyas/draft/__init__.py says how a family plugs into the one loader)."""
