// The page of something that does not exist: nothing to load (dashboard.js shows health).
"use strict";
