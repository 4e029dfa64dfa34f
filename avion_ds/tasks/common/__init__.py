"""What more than one task uses: the classification evaluation loop, prediction gathering, the
classification / action-head / retrieval metrics, the retrieval evaluation and the weights report."""
