// Parse LogQL expressions with Grafana's own grammar (@grafana/lezer-logql).
// Input (stdin): a JSON object {name: expression}. Output (stdout): a JSON object
// {name: null | "error at <offset>: <context>"}. Exit status 0 when every
// expression parsed, 1 when one did not, 2 on bad input.
"use strict";
const { parser } = require("@grafana/lezer-logql");

function check(expr) {
  const tree = parser.parse(expr);
  let error = null;
  tree.iterate({
    enter(node) {
      if (error === null && node.type.isError) {
        const from = Math.max(0, node.from - 20);
        error = `error at ${node.from}: ...${expr.slice(from, node.from)}<HERE>${expr.slice(node.from, node.from + 20)}...`;
      }
    },
  });
  if (error === null && tree.topNode.name !== "LogQL") error = `top node is ${tree.topNode.name}`;
  return error;
}

let input = "";
process.stdin.setEncoding("utf8");
process.stdin.on("data", (chunk) => (input += chunk));
process.stdin.on("end", () => {
  let exprs;
  try {
    exprs = JSON.parse(input);
  } catch (e) {
    process.stderr.write(`bad input: ${e.message}\n`);
    process.exit(2);
  }
  const out = {};
  let failed = false;
  for (const [name, expr] of Object.entries(exprs)) {
    out[name] = check(expr);
    if (out[name] !== null) failed = true;
  }
  process.stdout.write(JSON.stringify(out, null, 1) + "\n");
  process.exit(failed ? 1 : 0);
});
