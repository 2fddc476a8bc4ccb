"""Helper run by test_multiprocess: one training step on the tiny model, metrics printed as JSON."""
import json, sys
from rao_core.samples import Sample
from rao_core.train import TrainerConfig, train
from rao_core.paths import tiny_model_path
samples = [Sample(tree_id=f"t{i}", node_id="r", group_id="g", depth=i % 2, token_ids=[1, 520, 3412, 28, 800 + i, 2+i],
                   assistant_mask=[0, 0, 0, 0, 1, 1], behaviour_logprobs=[0, 0, 0, 0, -10.0, -10.0],
                   success=float(i % 2), reward=float(i % 2), baseline=0.5, advantage=(i % 2) - 0.5) for i in range(5)]
res = train(samples, tiny_model_path(), sys.argv[1], TrainerConfig(loss_type="reinforce", lr=1e-3, micro_batch_size=1))
print("METRICS", json.dumps(res.metrics[0]))
