"""Resolving job, rank and the shared TraceID from launcher variables, without communication."""

import pytest

from jobtrace.errors import ConfigError
from otel_instrumentation import resolve_identity, trace_id_for_job


class TestLaunchers:
    def test_torchrun(self):
        """torchrun/torchelastic variables give rank, local rank, world and the run id as job."""
        ident = resolve_identity({"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "TORCHELASTIC_RUN_ID": "run42"})
        assert (ident.job_id, ident.rank, ident.local_rank, ident.world_size, ident.launcher) == ("run42", 5, 1, 8, "torchrun")

    def test_slurm_with_node_name_and_array_task(self):
        env = {"SLURM_JOB_ID": "991", "SLURM_PROCID": "7", "SLURM_LOCALID": "3", "SLURM_NTASKS": "16",
               "SLURMD_NODENAME": "gpu-a12", "SLURM_ARRAY_JOB_ID": "990", "SLURM_ARRAY_TASK_ID": "4"}
        ident = resolve_identity(env)
        assert (ident.job_id, ident.rank, ident.local_rank, ident.world_size, ident.node) == ("990_4", 7, 3, 16, "gpu-a12")
        assert ident.launcher == "slurm"

    def test_open_mpi(self):
        env = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4",
               "OMPI_MCA_ess_base_jobid": "123456"}
        ident = resolve_identity(env)
        assert (ident.job_id, ident.rank, ident.world_size, ident.launcher) == ("123456", 2, 4, "openmpi")

    def test_mpich_hydra(self):
        ident = resolve_identity({"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "JOBTRACE_JOB_ID": "m"})
        assert (ident.rank, ident.local_rank, ident.world_size, ident.launcher) == (3, 1, 4, "mpich")

    def test_deepspeed_launcher_without_run_id_derives_a_shared_job_id(self):
        """DeepSpeed's launcher sets no job id: every rank derives the same one from MASTER_ADDR/PORT."""
        base = {"WORLD_SIZE": "4", "CROSS_RANK": "0", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
        a = resolve_identity(base | {"RANK": "0", "LOCAL_RANK": "0"})
        b = resolve_identity(base | {"RANK": "3", "LOCAL_RANK": "3"})
        assert a.launcher == "deepspeed" and a.job_id == b.job_id and a.trace_id == b.trace_id
        assert any("JOBTRACE_JOB_ID" in w for w in a.warnings)

    def test_plain_single_process(self):
        """No launcher at all: rank 0 of 1 with a fresh local job id."""
        ident = resolve_identity({})
        assert (ident.rank, ident.world_size, ident.launcher) == (0, 1, "none")
        assert ident.job_id.startswith("local-")


class TestPrecedence:
    def test_arguments_then_jobtrace_variables_win(self):
        env = {"RANK": "1", "WORLD_SIZE": "4", "JOBTRACE_RANK": "2", "JOBTRACE_JOB_ID": "x"}
        assert resolve_identity(env).rank == 2
        assert resolve_identity(env, rank=3).rank == 3

    def test_conflicting_variables_are_reported_not_hidden(self):
        """torchrun says rank 1, SLURM says rank 9: torchrun wins and the conflict is named."""
        env = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "r",
               "SLURM_PROCID": "9", "SLURM_NTASKS": "16", "SLURM_JOB_ID": "5"}
        ident = resolve_identity(env)
        assert ident.rank == 1 and ident.world_size == 4 and ident.job_id == "r"
        assert any("rank" in w and "slurm" in w and "torchrun" in w for w in ident.warnings)

    def test_rank_outside_world_is_a_clear_error(self):
        with pytest.raises(ConfigError, match="outside world size"):
            resolve_identity({"RANK": "4", "WORLD_SIZE": "4"})

    def test_non_integer_rank_is_a_clear_error(self):
        with pytest.raises(ConfigError, match="RANK='abc'"):
            resolve_identity({"RANK": "abc"})

    def test_job_id_cannot_escape_the_store(self):
        with pytest.raises(ConfigError):
            resolve_identity({"JOBTRACE_JOB_ID": "../../etc"})


class TestTraceId:
    def test_every_rank_derives_the_same_trace_id(self):
        ids = {resolve_identity({"RANK": str(r), "WORLD_SIZE": "8", "TORCHELASTIC_RUN_ID": "job"}).trace_id
               for r in range(8)}
        assert ids == {trace_id_for_job("job")}
        assert len(trace_id_for_job("job")) == 32 and trace_id_for_job("job") != trace_id_for_job("job2")

    def test_w3c_traceparent_wins(self):
        tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        ident = resolve_identity({"TRACEPARENT": tp, "JOBTRACE_JOB_ID": "x"})
        assert (ident.trace_id, ident.parent_span_id) == ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")

    def test_malformed_traceparent_is_ignored_with_a_warning(self):
        ident = resolve_identity({"TRACEPARENT": "00-zz-1", "JOBTRACE_JOB_ID": "x"})
        assert ident.trace_id == trace_id_for_job("x") and ident.warnings
