// The colour theme: GetConfig's `theme` (light, dark, system) on the root
// element as data-theme, which app.css reads; "system" (and no config yet)
// follows the browser's prefers-color-scheme.
import { enumJsonName, ThemeSchema, type ConfigInfo } from "../src/index.js";

export function applyTheme(config: ConfigInfo | undefined): void {
  const theme = config ? enumJsonName(ThemeSchema, config.theme) : "";
  const root = document.documentElement;
  if (theme) {
    if (root.dataset.theme !== theme) root.dataset.theme = theme;
  } else delete root.dataset.theme;
}
