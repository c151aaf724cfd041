// The bridge as the tests run it: the production Worker and objects, with
// the cell's container at the Durable Object's boundary replaced by the
// real cell agent on loopback (LoopbackContainer). Production code has no
// path to this module.

import { CellObject as ProductionCell, type CellRecord } from "../src/cell.js";
import type { CellContainer } from "../src/container.js";
import type { Env } from "../src/env.js";
import worker, { Registry } from "../src/index.js";
import { LoopbackContainer } from "./loopback.js";

export interface TestEnv extends Env {
  LOOPBACK_MANAGER: string;
}

export class CellObject extends ProductionCell {
  protected override makeContainer(ctx: DurableObjectState, env: Env): CellContainer {
    const manager = (env as TestEnv).LOOPBACK_MANAGER;
    return new LoopbackContainer(manager, async () => (await ctx.storage.get<CellRecord>("cell"))?.cell_id ?? null);
  }
}

export { Registry };
export default worker;
