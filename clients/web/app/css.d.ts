// esbuild bundles the stylesheet an entry imports into its own hashed .css file.
declare module "*.css";
