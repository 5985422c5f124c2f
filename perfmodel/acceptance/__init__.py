"""How many tokens a step accepts: acceptance curves and presets, Medusa trees and their
expected acceptance, and what a batch of sequences accepts together."""
