"""The closed loop: predict the Medusa speedup, then run the decoder and compare.

The closed loop, on this machine and the bundled model (or any checkpoint):
1. plain decoding of held-out prompts: the heads' top-k accuracies a_k^(i) on its output,
   which choose the greedy tree of each size, and the heads' predictions at every
   position of it, through which each tree's greedy steps are replayed (exactly the
   decoder's: verification is deterministic and the text is the plain pass's) for its
   acceptance; what the accuracies alone predict (heads independent) is shown beside;
2. measured speedups: plain decoding and Medusa with every tree, timed interleaved
   prompt by prompt (decoder.measure.decode_interleaved), so a drifting machine slows
   all of them alike;
3. operator latencies: every op of the reference decoder's step (perfmodel.latency.step, flavor
   `reference`) timed by the profilers at the run's batch, mean context and each tree
   size, and the decoder's own plain step, all sampled in turn in the same rounds, and
   those rounds taken between the batches of step 2, so that the prediction and the
   measurement see one machine even where its speed wanders by 10-20% over minutes;
4. prediction per tree size n: acceptance / (step(n) / step(1)), step(n) = the sum of its
   op latencies + the host overhead (Python, module calls and dispatch between the ops):
   the one calibrated constant, the plain step minus its ops, never from a Medusa run.
   A tree step's ops are timed at the context its attention spans: the decoder pads every
   sequence to the batch's longest, which runs ahead of the mean in a batch of prompts
   that accept at different rates (perfmodel.acceptance.batching.attended_context).
   The acceptance is each prompt's, and a batch steps until its slowest prompt is done
   (perfmodel.acceptance.batching counts the steps).

Acceptance schemes and trees: `--acceptance typical` predicts (simulates) from the
scheme's own record, head accuracies against what typical acceptance emits (an untimed typical pass
with the largest tree); `--dynamic` runs, beside every static tree, the dynamic tree of the
same node count (built each step from the heads' probabilities), predicted from those
probabilities mapped to hit rates measured on the plain pass, its step priced with the
measured cost of building the tree.

Modules: config (the run's settings), record (the untimed passes: trees and their
acceptance), runs (decoding and operator timings), predict (the measured runs priced by
the performance model), compare (the tables printed and written), loop (all of it, batch
by batch). python -m perfmodel.validate is the command.
"""
