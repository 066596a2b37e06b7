"""The three routers trained on real text: MoL L0 decode, Contextual MoL, MoL2 pointer head."""
