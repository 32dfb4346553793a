"""Running the node as a background process the volunteer controls.

protocol (messages, stdlib only), vocabulary (the round's phases and figure keys, stdlib
only), client (starts and drives the process; no heavy imports),
supervisor (restarts after crashes), worker (the process itself), controller (pause, throttle
and stop inside the round), throttle (the duty cycle), rules + schedule + system (when the
node may run). Only worker, controller and layerhooks import torch.
"""
