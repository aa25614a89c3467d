"""What is checked: the clauses of docs/contract.md, the case registry, and the option values a
request runs with (the defaults the contract defines)."""
