"""`chatfleet deploy k8s` (docs/deploy.md): Kubernetes manifests for a fleet on L4 nodes, a
Prometheus scrape config and a Grafana dashboard, built as Python dicts and written with PyYAML.
Nothing here touches a cluster.

- plan.py: the deployment's inputs (`DeployPlan`), read from a `chatfleet plan --json`
  document or built from flags with the same adapters the plan uses;
- objects.py: the cluster options (`K8sOptions`) and the Kubernetes objects: an SGLang
  Deployment and Service per replica, the gateways with their config, Redis;
- monitoring.py: what Prometheus scrapes and the Grafana dashboard, with the checks' helpers
  (every query's metric names, the queries as recording rules);
- files.py: every object and text as the files of a folder (`manifests`), and writing them.
"""
