# The cluster scenario's executor and submitter (e2e/cluster/executor.py, submit.py), for
# kind (e2e/kind.sh). On the local node e2e/cluster/images.sh writes the same image from
# the host's python3. Build from e2e/cluster: docker build -f e2e.Dockerfile .
FROM python:3.11-slim
COPY executor.py submit.py /app/
USER 65532:65532
ENTRYPOINT ["python3"]
