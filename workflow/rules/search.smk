# sweep.search: round r's ask job tells the study round r-1's results and asks round r's
# trials (cifarflow/controller/rounds.py); a checkpoint, so round r's trials join the DAG
# once it ran. Round rounds+1's record says the last round was told.
localrules:
    ask_trials,


checkpoint ask_trials:
    input:
        **get_round_inputs(),
    output:
        record=ROUND_RECORD,
    log:
        f"{RESULTS}/logs/search/{{study}}/round-{{round}}.log",
    wildcard_constraints:
        study=get_study_pattern(),
        round=r"\d+",
    params:
        samples=get_search_setting("samples"),
        rounds=get_search_setting("rounds"),
    run:
        PLAN.search_rules.tell_and_ask(wildcards, output)
