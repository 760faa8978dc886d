"""`cadence simulate`: a discrete-event simulator of an RLVR or agentic run on a GPU cluster.

cadence's own scheduler (RolloutWorker admission under alpha, RLVRProducer's
queue scheduling and prompt replication, the InferenceHub's routing, the
SampleBuffer's freshness rule) drives mock engine replicas whose step costs
come from a memory-bound decode model, against a trainer costed by a
compute-bound model, on a virtual clock. See docs/scaling.md.

    config.py      the inputs (pydantic; presets/ hold the paper's setups)
    costs.py       decode, prefill, training and weight-sync cost models
    theory.py      ROLL Flash's mu_gen, L_gen, mu_train and beta* from the cost model
    stand_ins.py   tokenizer / reward / prompts a simulated worker needs
    worker.py      RolloutWorker on mock replicas, its loop on virtual time
    cluster.py     one run: workers + trainer -> throughput, staleness, step times
    virtual_asyncio.py  an asyncio loop on virtual time, and a hub whose rounds take it
    agentic.py     one agentic run: the same worker playing episodes
    sim.py         simulate(cfg): one run of either kind
    sweeps.py      the questions: scaling, split, alpha, tail, agentic, env latency
"""
