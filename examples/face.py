"""One small scenario three ways (theory, virtual clock, real processes), with `import tailtrain`.

Run it with `python examples/face.py` (about 10 s: train starts 2 local ranks on gloo).
"""

import tailtrain

if __name__ == "__main__":  # train's ranks start from a fork server, which re-reads this file
    scenario = tailtrain.Scenario(task="logreg", workers=2, iterations=20, delay="exp:rate=100")
    print(f"predict: {tailtrain.predict(scenario, 'sync').rows[0].iteration_time:.4f} s/iteration")
    simulated = tailtrain.simulate(scenario, "sync", seed=0).summary
    trained = tailtrain.train(scenario, "sync", seed=0, inject=True).summary
    for name, s in (("simulate", simulated), ("train", trained)):
        print(f"{name}: {s['mean_iteration_time']:.4f} s/iteration, loss {s['final_loss']:.3f}")
