"""Tensor parallelism: one model split over several ranks of one host (docs/tensor-parallelism.md).

group.py: the rank's place in the group and the collectives its layers call; launch.py: rank 0 starting the
other ranks and watching them; follower.py: what a rank other than 0 runs; step_mirror.py: rank 0 sending
each step's inputs to the others.
"""
