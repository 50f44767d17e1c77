// The peer workflow on Restate: one service handler, three durable steps
// (`ctx.run`), each a trivial pure function. run.sh copies this file next
// to its node_modules (target/peers/node/) and registers it with
// restate-server; the load client calls the ingress, which answers when
// the handler has returned.
// The SDK calls Promise.withResolvers (Node >= 22); Node 20 lacks it.
if (typeof Promise.withResolvers !== "function") {
  Promise.withResolvers = function () {
    let resolve, reject;
    const promise = new this((res, rej) => {
      resolve = res;
      reject = rej;
    });
    return { promise, resolve, reject };
  };
}
const restate = await import("@restatedev/restate-sdk");

const port = Number(process.env.PORT || 19080);

const bench = restate.service({
  name: "Bench",
  handlers: {
    run: async (ctx, input) => {
      const n = Number(input?.n ?? 0);
      const a = await ctx.run("step1", () => ({ n: n + 1 }));
      const b = await ctx.run("step2", () => ({ n: a.n + 1 }));
      const c = await ctx.run("step3", () => ({ n: b.n + 1, status: "completed" }));
      return c;
    },
  },
});

restate.serve({ services: [bench], port });
