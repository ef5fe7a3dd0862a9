"""The tests' oracles: the project's own PyTorch definitions of both networks (the authors' module
trees, written from shared/spec/) and the pre/post-processing of the authors' demos.

sapiens_v1  Sapiens v1 (ViT + VitHead) and the Sapiens-Lite demo pipeline
sapiens2    Sapiens2 (RMSNorm ViT, 2D RoPE in bf16, GQA, deconvolution head), its strict loader,
            the Hugging Face key mapping and the demo pipeline

Nothing here imports the fixture makers (tests/fixtures/): they import these modules. Import with
tests/ on sys.path: `from reference import sapiens2 as s2`.
"""
