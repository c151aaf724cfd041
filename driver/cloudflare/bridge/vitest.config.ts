import { cloudflareTest } from "@cloudflare/vitest-pool-workers";
import { defineConfig } from "vitest/config";

export const TEST_TOKEN = "test-token-0123456789abcdef0123456789abcdef";

export default defineConfig({
  plugins: [
    cloudflareTest(({ inject }) => ({
      main: "./test/entry.ts",
      miniflare: {
        compatibilityDate: "2026-04-26",
        compatibilityFlags: ["nodejs_compat", "enable_request_signal"],
        durableObjects: { CELLS: "CellObject", REGISTRY: "Registry" },
        bindings: {
          BRIDGE_TOKEN: TEST_TOKEN,
          CELL_IMAGE: "registry.example/sandboxwich-cell@sha256:" + "a".repeat(64),
          CELL_INSTANCE_TYPE: "basic",
          CONTAINER_CLASS: "CellObject",
          LOOPBACK_MANAGER: inject("managerURL"),
        },
      },
    })),
  ],
  test: {
    globalSetup: ["./test/global-setup.ts"],
    testTimeout: 120_000,
    hookTimeout: 120_000,
  },
});
