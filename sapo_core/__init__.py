"""SAPO Swarm's engine: a node that post-trains a small language model with GRPO and shares
its rollouts with a swarm (SAPO, "Sharing is Caring", arXiv 2509.08721).

Not to be confused with Qwen's "Soft Adaptive Policy Optimization" (arXiv 2511.20347, TRL's
`loss_type="sapo"`), a different algorithm that shares the acronym.

This package never imports Qt; the desktop app in `app/` talks to it only through
`sapo_core.control.protocol`.
"""

__version__ = "0.1.0"
