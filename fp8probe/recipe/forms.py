"""The shapes of recipe a rollout framework can apply (deploy.frameworks says which framework takes which):

    free        any set of fused groups in BF16 (an ignore list of module names)
    keywords    first/last N blocks in BF16 plus substring keywords (NeMo-RL); any free recipe is expressible
    first-last  the first N and last M decoder blocks in BF16, the rest in FP8
    all         every Linear in FP8 (lm_head, embeddings and MoE routers stay BF16)
    none        no FP8 weights (BF16 rollouts); an FP8 KV cache only where the framework takes one
"""

FORMS = ("free", "keywords", "first-last", "all", "none")
